"""llama.cpp builds, seen through ctypes and tqbridge's shim."""
