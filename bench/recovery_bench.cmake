# SPDX-License-Identifier: Apache-2.0
# recovery_bench: kill-to-next-batch latency of the client under `ringloaderd --supervise`.
add_executable(recovery_bench ${CMAKE_CURRENT_LIST_DIR}/recovery_bench.cc)
target_link_libraries(recovery_bench PRIVATE ringloader_client ringloader_image CLI11::CLI11)
target_compile_definitions(recovery_bench PRIVATE RINGLOADERD_PATH="$<TARGET_FILE:ringloaderd>")
add_dependencies(recovery_bench ringloaderd)
ringloader_warnings(recovery_bench)
set_target_properties(recovery_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
