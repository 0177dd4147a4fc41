# stoke_pc_flags(OUT IMPLICIT_DIRS ITEM...): the link ITEMs, a CMake list (pkg-config flags such
# as "-L/usr/lib/x86_64-linux-gnu;-luring" from pkg_check_modules' _LDFLAGS, full library paths
# from find_library, bare names), as one space-separated string of flags for a .pc file's Libs:
# "/opt/j/lib/libjpeg.so" becomes "-L/opt/j/lib -ljpeg", "m" becomes "-lm", other flags stay.
# No -L for a directory in the list IMPLICIT_DIRS (the linker searches those anyway); each -L
# once.  Writing a list into a .pc file as it is gives one flag "-L/usr/lib\;-luring" that no
# linker understands.
#
# As a script, for tests: cmake -DITEMS="a;b" [-DIMPLICIT="d;e"] -P stoke_pc_flags.cmake
# prints the flags.
if(CMAKE_SCRIPT_MODE_FILE)
  cmake_minimum_required(VERSION 3.18) # IN_LIST
endif()

function(stoke_pc_flags out implicit_dirs)
  set(flags "")
  set(dirs "")
  foreach(item IN LISTS ARGN)
    set(dir "")
    set(flag "")
    if(item MATCHES "^-L(.+)$")
      set(dir "${CMAKE_MATCH_1}")
    elseif(item MATCHES "^-")
      set(flag "${item}")
    elseif(IS_ABSOLUTE "${item}")
      get_filename_component(dir "${item}" DIRECTORY)
      get_filename_component(name "${item}" NAME)
      if(name MATCHES "^lib(.+)\\.(so|a|so\\.[0-9.]+)$")
        set(flag "-l${CMAKE_MATCH_1}")
      else()
        set(dir "")
        set(flag "${item}") # a file to link as it is (an object, an unusual name)
      endif()
    elseif(NOT item STREQUAL "")
      set(flag "-l${item}")
    endif()
    string(REGEX REPLACE "(.)/+$" "\\1" dir "${dir}")
    if(NOT dir STREQUAL "" AND NOT dir IN_LIST dirs AND NOT dir IN_LIST implicit_dirs)
      list(APPEND dirs "${dir}")
      list(APPEND flags "-L${dir}")
    endif()
    if(NOT flag STREQUAL "" AND NOT flag IN_LIST flags)
      list(APPEND flags "${flag}")
    endif()
  endforeach()
  string(JOIN " " flags ${flags})
  set(${out} "${flags}" PARENT_SCOPE)
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  stoke_pc_flags(result "${IMPLICIT}" ${ITEMS})
  message("${result}")
endif()
