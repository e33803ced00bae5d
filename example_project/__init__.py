"""Example applications protected by stampede: a Django site and a Flask app,
each with an expensive page, and the ``stampede demo`` driver that puts them
under a stampede."""
