"""Reports: an executed notebook as a shareable, self-contained HTML file.
"""
