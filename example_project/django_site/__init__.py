"""A small Django site whose expensive pages are cached the usual Django ways:
``cache_page`` on a view and ``{% cache %}`` around a template fragment."""
