# SPDX-License-Identifier: Apache-2.0
# ring_bench: handoff latency and slot write bandwidth of the shm ring (prints figures only).
add_executable(ring_bench ${CMAKE_CURRENT_LIST_DIR}/ring_bench.cc)
target_link_libraries(ring_bench PRIVATE ringloader_shm)
ringloader_warnings(ring_bench)
set_target_properties(ring_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
