# Warnings apply to our own targets only (generated protobuf code is built with them relaxed).
function(ringloader_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow=local
                         -Wnon-virtual-dtor -Wimplicit-fallthrough)
  if(RINGLOADER_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
