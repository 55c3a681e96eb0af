// Anchors the loradb_kernels library so it always has at least one object file.
namespace loradb::kernels {
const char* KernelsLibraryName() { return "loradb_kernels"; }
}  // namespace loradb::kernels
