"""tqbridge.metal"""
