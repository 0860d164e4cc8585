# SPDX-License-Identifier: Apache-2.0
# rss_bench: ringloaderd's RSS over 120 epochs with 1, 2, 4 and 8 streams.
add_executable(rss_bench ${CMAKE_CURRENT_LIST_DIR}/rss_bench.cc)
target_link_libraries(rss_bench PRIVATE ringloader_client ringloader_image ringloader_proto
                                           gRPC::grpc++ CLI11::CLI11)
target_compile_definitions(rss_bench PRIVATE RINGLOADERD_PATH="$<TARGET_FILE:ringloaderd>")
add_dependencies(rss_bench ringloaderd)
ringloader_warnings(rss_bench)
set_target_properties(rss_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
