"""Tools that are not part of the public API: the generator of the sample workspace.
"""
