# SPDX-License-Identifier: Apache-2.0
# eval_cache_bench: eval epochs served from the cache, images/s per epoch.
add_executable(eval_cache_bench ${CMAKE_CURRENT_LIST_DIR}/eval_cache_bench.cc)
target_link_libraries(eval_cache_bench PRIVATE ringloader_client ringloader_image CLI11::CLI11)
target_compile_definitions(eval_cache_bench PRIVATE RINGLOADERD_PATH="$<TARGET_FILE:ringloaderd>")
add_dependencies(eval_cache_bench ringloaderd)
ringloader_warnings(eval_cache_bench)
set_target_properties(eval_cache_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
