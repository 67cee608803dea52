"""`rmq admin`: the admin client (MQAdminExt's calls over remoting) and mqadmin's commands.

Import `rmq_core.admin.client.AdminClient` for programmatic use; the commands under
`rmq_core.admin.commands` print rich tables (rich is imported there only, never by `import rmq_core`).
"""
from rmq_core.admin.client import AdminClient, AdminError

__all__ = ["AdminClient", "AdminError"]
