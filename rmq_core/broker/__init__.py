"""The broker: processors, services and the controller that owns them."""
