"""peers"""
