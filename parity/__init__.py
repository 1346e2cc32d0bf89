"""tqbridge.parity"""
