"""queen"""
