# The fuzz targets from the test command (ctest -L fuzz in a GCC build, as CI's): Fuzz.ReadersUnderClang configures
# a clang build of its own beside this one (fuzz-clang/, TWIN_FUZZ=ON), builds only the five fuzz targets there and
# runs each for TWIN_FUZZ_SECONDS (ctest -L fuzz -j 2 there: three rounds of 8 s at the default). Without clang and its
# libFuzzer runtime (Debian: clang, libclang-rt-14-dev; scripts/install-deps.sh installs both) the test reports
# itself skipped, naming what is missing. It runs alone (RUN_SERIAL), as the sanitizer jobs do.
find_program(TWIN_CLANGXX NAMES clang++ clang++-14)
find_program(TWIN_CLANG NAMES clang clang-14)
set(fuzz_missing "")
if(NOT TWIN_CLANGXX OR NOT TWIN_CLANG)
  set(fuzz_missing "clang (apt install clang)")
else()
  execute_process(COMMAND ${TWIN_CLANGXX} -print-file-name=libclang_rt.fuzzer-x86_64.a
                  OUTPUT_VARIABLE fuzz_runtime OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT IS_ABSOLUTE "${fuzz_runtime}" OR NOT EXISTS "${fuzz_runtime}")
    set(fuzz_missing "clang's libFuzzer runtime (apt install libclang-rt-14-dev)")
  endif()
endif()
if(fuzz_missing STREQUAL "")
  add_test(NAME Fuzz.ReadersUnderClang
           COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DBUILD_DIR=${CMAKE_BINARY_DIR}/fuzz-clang
                   -DCLANG=${TWIN_CLANG} -DCLANGXX=${TWIN_CLANGXX} -DSECONDS=${TWIN_FUZZ_SECONDS}
                   "-DLAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}" -P ${CMAKE_CURRENT_LIST_DIR}/run_nested.cmake)
  set_tests_properties(Fuzz.ReadersUnderClang PROPERTIES LABELS fuzz RUN_SERIAL TRUE TIMEOUT 1500)
else()
  add_test(NAME Fuzz.ReadersUnderClang
           COMMAND ${CMAKE_COMMAND} -E echo "Fuzz.ReadersUnderClang skipped: ${fuzz_missing} not found")
  set_tests_properties(Fuzz.ReadersUnderClang PROPERTIES LABELS fuzz SKIP_REGULAR_EXPRESSION "skipped:")
endif()
