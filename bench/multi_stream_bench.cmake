# SPDX-License-Identifier: Apache-2.0
# multi_stream_bench: one trainer vs several on one daemon, images/s.
add_executable(multi_stream_bench ${CMAKE_CURRENT_LIST_DIR}/multi_stream_bench.cc)
target_link_libraries(multi_stream_bench PRIVATE ringloader_client ringloader_image CLI11::CLI11)
target_compile_definitions(multi_stream_bench PRIVATE RINGLOADERD_PATH="$<TARGET_FILE:ringloaderd>")
add_dependencies(multi_stream_bench ringloaderd)
ringloader_warnings(multi_stream_bench)
set_target_properties(multi_stream_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
