# Finds the Python interpreter and nanobind for the pagoda._core module and, when both are there,
# makes every library position independent so that the module can link them. Included from the
# top-level CMakeLists.txt before the libraries are defined; sets PAGODA_WITH_PYTHON.
find_package(Python 3.9 COMPONENTS Interpreter Development.Module)
if(Python_FOUND)
  # nanobind is a pip package: ask the interpreter the module is built for where its CMake files are.
  execute_process(COMMAND ${Python_EXECUTABLE} -m nanobind --cmake_dir
                  OUTPUT_VARIABLE nanobind_cmake_dir OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE nanobind_missing ERROR_QUIET)
  if(NOT nanobind_missing)
    find_package(nanobind CONFIG PATHS ${nanobind_cmake_dir} NO_DEFAULT_PATH)
  endif()
endif()
if(nanobind_FOUND)
  set(PAGODA_WITH_PYTHON ON)
  set(CMAKE_POSITION_INDEPENDENT_CODE ON)
  # -fPIC alone would let every exported function be interposed at load time, which stops GCC
  # inlining and cloning them; nothing here is meant to be interposed.
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fno-semantic-interposition>)
elseif(PAGODA_PYTHON STREQUAL "ON")
  message(FATAL_ERROR "PAGODA_PYTHON=ON but nanobind was not found (pip install nanobind; scripts/setup.sh does)")
endif()
