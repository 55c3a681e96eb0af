// Paths of this build that tests and fixtures need: the source tree, the test data folder, the
// build folder and the built `loradb` command. They are compiled into one small object
// (tests/test_paths.cc) rather than passed as -D flags to every test file, so that a test file's
// compile line is the same in every checkout and ccache can share its object between them.
#ifndef LORADB_TESTS_TEST_PATHS_H_
#define LORADB_TESTS_TEST_PATHS_H_

namespace loradb::test_paths {
const char* SourceDir();
const char* TestDataDir();
const char* BuildDir();
const char* CliPath();
}  // namespace loradb::test_paths

#define LORADB_SOURCE_DIR (::loradb::test_paths::SourceDir())
#define LORADB_TESTDATA_DIR (::loradb::test_paths::TestDataDir())
#define LORADB_BUILD_DIR (::loradb::test_paths::BuildDir())
#define LORADB_CLI_PATH (::loradb::test_paths::CliPath())

#endif  // LORADB_TESTS_TEST_PATHS_H_
