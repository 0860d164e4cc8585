# SPDX-License-Identifier: Apache-2.0
# pipeline_bench: plain tjDecompress2 vs. the pipeline (decode + train augmentation + batching).
add_executable(pipeline_bench ${CMAKE_CURRENT_SOURCE_DIR}/pipeline_bench.cc)
target_link_libraries(pipeline_bench PRIVATE ringloader_pipeline ringloader_ctl libjpeg-turbo::turbojpeg
                      CLI11::CLI11)
set_target_properties(pipeline_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
ringloader_warnings(pipeline_bench)
