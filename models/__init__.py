"""The model zoo (issue 7): models built on the graph layer, and `python -m models`. Empty until then."""
