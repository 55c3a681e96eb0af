# Compile flags every loradb target gets through loradb::warnings.
add_library(loradb_warnings INTERFACE)
add_library(loradb::warnings ALIAS loradb_warnings)
target_compile_options(loradb_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX,C>:-Wall -Wextra>
  $<$<AND:$<COMPILE_LANGUAGE:CXX,C>,$<BOOL:${LORADB_WERROR}>>:-Werror>
  $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${LORADB_WERROR}>>:-Werror=all-warnings>)

if(LORADB_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
elseif(LORADB_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT LORADB_SANITIZE STREQUAL "")
  message(FATAL_ERROR "LORADB_SANITIZE must be '', 'address' or 'thread'")
endif()
