"""Jobs that hold cards and measure: one cell run on its session's server (bench), a profiled
tensor-parallel decode (coordination), the interconnect control (link) and the memory
bandwidth (hardware)."""
