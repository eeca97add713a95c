"""searchrl.demo: the offline demo, end to end (`searchrl demo`, what `make demo` runs)."""
