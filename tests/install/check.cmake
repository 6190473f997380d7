# ctest install.consumer: installs the build tree BIN into a scratch prefix and builds and runs
# tests/install (a program that finds mla_decode with find_package) against it.
#   cmake -DBIN=<build dir> -DSRC=<tests/install> -DWORK=<scratch dir> -P check.cmake
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BIN} --prefix ${WORK}/prefix
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install ${BIN} failed: ${rc}")
endif()
foreach(f include/mla/mla.hpp bin/mla)  # (the package under the platform's lib directory)
  if(NOT EXISTS ${WORK}/prefix/${f})
    message(FATAL_ERROR "the install lacks ${f}")
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC} -B ${WORK}/build -G Ninja -DCMAKE_BUILD_TYPE=Release
                        -DCMAKE_PREFIX_PATH=${WORK}/prefix RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer against the install failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${WORK}/build/consumer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the consumer failed: ${rc}")
endif()
