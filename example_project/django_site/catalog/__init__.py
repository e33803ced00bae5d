"""The example site's products: editing one marks every page that shows it stale."""
