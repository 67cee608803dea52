"""The admin client's calls, one module per command family (as rmq_core.admin.commands): each
family a class over the transport, AdminClient all of them."""
