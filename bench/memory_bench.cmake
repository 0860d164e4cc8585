# SPDX-License-Identifier: Apache-2.0
# memory_bench: ringloaderd's RSS against memory_limit over a 10-epoch run, 1,000 vs 50,000 samples.
add_executable(memory_bench ${CMAKE_CURRENT_LIST_DIR}/memory_bench.cc)
target_link_libraries(memory_bench PRIVATE ringloader_client ringloader_image ringloader_proto
                                           gRPC::grpc++ CLI11::CLI11)
target_compile_definitions(memory_bench PRIVATE RINGLOADERD_PATH="$<TARGET_FILE:ringloaderd>")
add_dependencies(memory_bench ringloaderd)
ringloader_warnings(memory_bench)
set_target_properties(memory_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
