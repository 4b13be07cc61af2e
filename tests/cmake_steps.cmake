# The steps of a nested build run by a test script (tests/sanitizers/run.cmake, tests/fuzz/run_nested.cmake):
# require_defined checks the script's -D arguments, run_step runs one command, says how long it took under
# STEP_LABEL, and fails the test when it fails.
function(require_defined script)
  foreach(variable ${ARGN})
    if(NOT DEFINED ${variable})
      message(FATAL_ERROR "${script} needs -D${variable}=...")
    endif()
  endforeach()
endfunction()

function(run_step what)
  string(TIMESTAMP start "%s")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status)
  string(TIMESTAMP end "%s")
  math(EXPR seconds "${end} - ${start}")
  message(STATUS "${STEP_LABEL}: ${what} in ${seconds} s")
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${STEP_LABEL}: ${what} failed (${status})")
  endif()
endfunction()
