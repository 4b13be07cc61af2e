# Configures BUILD_DIR as a clang fuzz build of SOURCE_DIR, builds the fuzz targets and runs them (tests/fuzz/
# nested.cmake says why). Any finding fails the test, with the input under BUILD_DIR/fuzz/<target>/artifacts/.
#   cmake -DSOURCE_DIR=... -DBUILD_DIR=... -DCLANG=clang -DCLANGXX=clang++ -DSECONDS=12 [-DLAUNCHER=ccache] -P ...
include(${CMAKE_CURRENT_LIST_DIR}/../cmake_steps.cmake)
require_defined(run_nested.cmake SOURCE_DIR BUILD_DIR CLANG CLANGXX SECONDS)
set(STEP_LABEL "fuzz")

# -O1 -g1 and a unity build, as the sanitizer jobs (tests/sanitizers/run.cmake says what a unity build asks of the
# sources): line numbers for a report at a fraction of the build time. No benchmarks; the fuzz build leaves CUDA out
# by itself.
run_step("configure" ${CMAKE_COMMAND} -G Ninja -S ${SOURCE_DIR} -B ${BUILD_DIR} -DCMAKE_BUILD_TYPE=RelWithDebInfo
         "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" -DCMAKE_UNITY_BUILD=ON -DCMAKE_C_COMPILER=${CLANG}
         -DCMAKE_CXX_COMPILER=${CLANGXX} -DTWIN_FUZZ=ON -DTWIN_FUZZ_SECONDS=${SECONDS} -DTWIN_BUILD_BENCH=OFF
         "-DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}")
run_step("build" ${CMAKE_COMMAND} --build ${BUILD_DIR} -j 2 --target fuzz_scenario fuzz_training_log fuzz_kineto
         fuzz_gpu_profile fuzz_checkpoint)
# Two targets at a time: each fuzzes on one core for SECONDS, so the five take three rounds instead of five (the test
# runs alone, RUN_SERIAL, on CI's two cores).
run_step("fuzzing" ${CMAKE_CTEST_COMMAND} --test-dir ${BUILD_DIR} -L fuzz -j 2 --output-on-failure)
