# Configures BUILD_DIR as a sanitizer build of SOURCE_DIR (SANITIZE: thread, or address,undefined), builds
# twin_sanitizer_tests there and runs the part of it this sanitizer is for. Any report fails the test (halt_on_error).
#   cmake -DSOURCE_DIR=... -DBUILD_DIR=... -DSANITIZE=thread [-DLAUNCHER=ccache] -P run.cmake
include(${CMAKE_CURRENT_LIST_DIR}/../cmake_steps.cmake)
require_defined(run.cmake SOURCE_DIR BUILD_DIR SANITIZE)
set(STEP_LABEL "sanitizers (${SANITIZE})")

# -O1 -g1: the line numbers a report needs, at a fraction of -O2 -g's build time (what CI's minutes allow). No CUDA
# (the sanitizers check host code; nvcc would only add build time), no benchmarks. A unity build (CMake compiles each
# target's sources in batches of 8, one compiler run a batch): the headers are parsed once a batch, not once a file
# (tests/fuzz/run_nested.cmake gives the time it saves). It needs the files of a target to keep distinct names for
# their file-local helpers: a helper several files need lives in a header (exec/core/sizes.hpp, exec/core/clock.hpp,
# model/scenario/counts.hpp). GCC takes a batch's sources for headers and warns of their anonymous-namespace types in
# a class defined there (-Wsubobject-linkage): not a defect in a .cpp, so that warning is off here.
run_step("configure" ${CMAKE_COMMAND} -G Ninja -S ${SOURCE_DIR} -B ${BUILD_DIR} -DCMAKE_BUILD_TYPE=RelWithDebInfo
         "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG -Wno-subobject-linkage" -DCMAKE_UNITY_BUILD=ON
         -DTWIN_SANITIZE=${SANITIZE} -DTWIN_WERROR=ON
         -DTWIN_BUILD_BENCH=OFF -DCMAKE_CUDA_COMPILER=NOTFOUND -DCMAKE_CUDA_COMPILER_LAUNCHER=
         "-DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}")
run_step("build" ${CMAKE_COMMAND} --build ${BUILD_DIR} --target twin_sanitizer_tests -j 2)

# The binary holds the files tests/sanitizers/CMakeLists.txt lists for this sanitizer, run whole, but for the parity
# plans: two that use every kind of group (TP, PP and DP with sequence parallelism, ZeRO-1, full recompute and the
# overlapped reduction; ZeRO-3's gathers). tp2_pp2_dp2 is the first's groups without its extras: not run again.
set(filter "*")
if(SANITIZE STREQUAL "thread")
  set(plan "Plans/ExecParityTest.LossesEqualTheSingleRankRun")
  set(filter "ExecThreadsCommunicator.*:ExecThreadPool.*:ExecWatchdog.*:ExecFailure.*:ExecGuards*")
  string(APPEND filter ":${plan}/composer_dp2_zero3:${plan}/everything_at_once")
endif()
set(ENV{TWIN_SOURCE_DIR} ${SOURCE_DIR})
set(ENV{TSAN_OPTIONS} "halt_on_error=1:second_deadlock_stack=1")
set(ENV{ASAN_OPTIONS} "halt_on_error=1:detect_leaks=1")
set(ENV{UBSAN_OPTIONS} "halt_on_error=1:print_stacktrace=1")
run_step("tests" ${BUILD_DIR}/tests/sanitizers/twin_sanitizer_tests --gtest_filter=${filter} --gtest_brief=1)
