# Read by CTest after the discovered fault tests (tests/faults/CMakeLists.txt adds it): the tests that start ranks under
# mpirun get the LeakSanitizer suppressions of OpenMPI's own leaks, as tests/exec/mpi_tests.cmake explains. Outside a
# sanitizer build nobody reads LSAN_OPTIONS.
set(suppressions ${CMAKE_CURRENT_LIST_DIR}/../exec/lsan-openmpi.supp)
foreach(test IN LISTS twin_fault_tests_TESTS)
  if(test MATCHES "^(Faults|Stragglers)\\.Mpi")
    set_tests_properties("${test}" PROPERTIES ENVIRONMENT_MODIFICATION
      "LSAN_OPTIONS=string_append::suppressions=${suppressions}:fast_unwind_on_malloc=0")
  endif()
endforeach()
