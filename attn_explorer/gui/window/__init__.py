"""The main window: page registry, toolbar, menus, banner, export and the app factory."""
