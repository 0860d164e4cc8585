# SPDX-License-Identifier: Apache-2.0
# client_bench: the trainer's path (handoff, copy-on-write, copy-out, images/s) through the real
# client and daemon (prints figures only).
add_executable(client_bench ${CMAKE_CURRENT_LIST_DIR}/client_bench.cc)
target_link_libraries(client_bench PRIVATE ringloader_client ringloader_proto ringloader_image gRPC::grpc++
                      CLI11::CLI11)
target_compile_definitions(client_bench PRIVATE RINGLOADERD_PATH="$<TARGET_FILE:ringloaderd>")
add_dependencies(client_bench ringloaderd)
ringloader_warnings(client_bench)
set_target_properties(client_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
