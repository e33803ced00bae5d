"""Example applications protected by stampede: a Django site and a Flask app,
each with an expensive page, and the demo (``python -m example_project.demo``,
or ``make demo``) that puts them under a stampede."""
