// The one test object compiled with this build's absolute paths (see test_paths.h).
#include "tests/test_paths.h"

namespace loradb::test_paths {
const char* SourceDir() { return LORADB_SOURCE_DIR_VALUE; }
const char* TestDataDir() { return LORADB_TESTDATA_DIR_VALUE; }
const char* BuildDir() { return LORADB_BUILD_DIR_VALUE; }
const char* CliPath() { return LORADB_CLI_PATH_VALUE; }
}  // namespace loradb::test_paths
