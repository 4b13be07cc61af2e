# Read by CTest after the discovered exec tests (tests/exec/CMakeLists.txt adds it): the tests that start ranks under
# mpirun get LeakSanitizer suppressions for OpenMPI's own leaks (lsan-openmpi.supp). Full unwinding on malloc lets
# the suppressions see the OpenMPI frames (the fast unwinder stops in OpenMPI's components, built without frame
# pointers). Outside a sanitizer build nobody reads LSAN_OPTIONS.
foreach(test IN LISTS twin_exec_tests_TESTS)
  if(test MATCHES "^Exec(Moe)?RunFixture\\.[A-Za-z]*Mpi")
    set_tests_properties("${test}" PROPERTIES ENVIRONMENT_MODIFICATION
      "LSAN_OPTIONS=string_append::suppressions=${CMAKE_CURRENT_LIST_DIR}/lsan-openmpi.supp:fast_unwind_on_malloc=0")
  endif()
endforeach()
