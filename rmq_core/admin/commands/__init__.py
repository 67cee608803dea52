"""mqadmin's commands, one module per subject (topic, cluster, consumer, message, dlq).

A command is a function `run(admin, args, out)` registered with `@command(name, help, *args)`;
`add_parsers` builds `rmq admin <command>` with mqadmin's flags plus -n (else NAMESRV_ADDR) and
--json, and `main` runs one, turning every failure into one line on stderr and a non-zero exit.
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from typing import Callable

import attrs

from rmq_core.acl import tools_credentials
from rmq_core.config import did_you_mean
from rmq_core.errors import RMQError, one_line


@attrs.frozen
class Arg:
    flags: tuple
    kwargs: dict


def arg(*flags, **kwargs) -> Arg:
    return Arg(flags, kwargs)


@attrs.frozen
class Command:
    name: str
    help: str
    args: tuple
    run: Callable
    needs_admin: bool = True
    needs_namesrv: bool = True  # False: the command may run with no name server (it asks a controller)

    @property
    def owns_n(self) -> bool:
        """The command gives -n another meaning (electMaster's -n brokerName, as mqadmin 5's):
        its name server is then --namesrvAddr only."""
        return any("-n" in a.flags for a in self.args)


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, *args: Arg, needs_admin: bool = True, needs_namesrv: bool = True):
    def register(fn):
        COMMANDS[name] = Command(name, help, args, fn, needs_admin, needs_namesrv)
        return fn
    return register


class UsageError(RMQError):
    """A bad flag value (named in the message)."""


class Parser(argparse.ArgumentParser):
    """argparse whose unknown (sub-)command names the nearest one rather than listing them all."""

    def _check_value(self, action, value):
        if action.choices is not None and value not in action.choices:
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{did_you_mean(value, action.choices)} "
                                                 f"({self.prog} -h lists them)")


class _OneLineParser(Parser):
    """argparse, but a usage error is one line on stderr (exit 2), naming the command."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _load() -> None:
    from rmq_core.admin.commands import acl, cluster, consumer, controller, dlq, message, topic  # noqa: F401 (they register)


def add_parsers(sub) -> None:
    """Add `admin` with one sub-command per mqadmin command to the `rmq` parser's subparsers."""
    _load()
    admin = sub.add_parser("admin", help="mqadmin's commands (rmq admin <command> -h)")
    cmds = admin.add_subparsers(dest="admin_command", required=True, metavar="<command>",
                                parser_class=_OneLineParser)
    commons = {}
    for owns_n in (False, True):
        common = commons[owns_n] = argparse.ArgumentParser(add_help=False)
        common.add_argument(*(("--namesrvAddr",) if owns_n else ("-n", "--namesrvAddr")), dest="namesrv", default=None,
                            help="name server address(es) 'host:port;host:port' (default: $NAMESRV_ADDR)")
        common.add_argument("--json", action="store_true", help="print the rows as a JSON array of objects")
        common.add_argument("--timeout", type=float, default=5.0, help="seconds per request (default 5)")
        add_credential_flags(common)
    nested = {}  # "dlq list" -> a `dlq` command with its own sub-commands
    for name in sorted(COMMANDS, key=str.lower):
        c = COMMANDS[name]
        subject, _, action = name.partition(" ")
        if action:
            if subject not in nested:
                sp = cmds.add_parser(subject, help=f"{subject} commands ({subject} <action> -h)")
                nested[subject] = sp.add_subparsers(dest=f"{subject}_action", required=True, metavar="<action>",
                                                    parser_class=_OneLineParser)
            p = nested[subject].add_parser(action, help=c.help, description=c.help, parents=[commons[c.owns_n]])
        else:
            p = cmds.add_parser(name, help=c.help, description=c.help, parents=[commons[c.owns_n]])
        for a in c.args:
            p.add_argument(*a.flags, **a.kwargs)
        p.set_defaults(admin_fn=c)
    admin.set_defaults(fn=main)


def main(args) -> int:
    """Run the chosen command: 0 on success, 1 with one line on stderr on any failure."""
    # (here, not at the top: every `rmq` run builds the commands' parsers; the client is loaded
    # only when an admin command runs)
    from rmq_core.admin.client import AdminClient
    from rmq_core.admin.output import Output

    cmd: Command = args.admin_fn
    out = Output(as_json=args.json)
    prog = f"rmq admin {cmd.name}"
    admin = None
    try:
        if cmd.needs_admin:
            access_key, secret_key = credentials(args)
            admin = AdminClient(args.namesrv, timeout=args.timeout, access_key=access_key, secret_key=secret_key,
                                require_namesrv=cmd.needs_namesrv)
        rc = cmd.run(admin, args, out)
        out.finish()
        return rc or 0
    except BrokenPipeError:
        raise  # the reader of our output is gone: `rmq` ends quietly (cli.main)
    except (RMQError, ValueError, OSError) as e:
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug of ours: still one line (-v shows where)
        if getattr(args, "verbose", 0):
            raise
        print(f"{prog}: internal error: {type(e).__name__}: {one_line(e)} (run with rmq -v admin ... for the traceback)",
              file=sys.stderr)
        return 1
    finally:
        if admin is not None:
            admin.close()


def add_credential_flags(parser) -> None:
    """--access-key / --secret-key, resolved by credentials() (`rmq admin`, `rmq dashboard`)."""
    parser.add_argument("--access-key", dest="access_key", default=None,
                        help="ACL account to sign with (default: $RMQ_ACCESS_KEY, else $ROCKETMQ_HOME/conf/tools.yml)")
    parser.add_argument("--secret-key", dest="secret_key", default=None,
                        help="its secret key (default: $RMQ_SECRET_KEY, else $ROCKETMQ_HOME/conf/tools.yml)")


def credentials(args) -> tuple[str | None, str | None]:
    """The account a command signs with: --access-key/--secret-key, else RMQ_ACCESS_KEY /
    RMQ_SECRET_KEY, else mqadmin's $ROCKETMQ_HOME/conf/tools.yml; (None, None) for unsigned."""
    if getattr(args, "access_key", None) or getattr(args, "secret_key", None):
        return args.access_key, args.secret_key
    return tools_credentials()



# --- value parsing shared by the commands ------------------------------------------------------------
def parse_bool(text: str) -> bool:
    t = str(text).strip().lower()
    if t in ("true", "1", "yes", "y"):
        return True
    if t in ("false", "0", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"bad boolean {text!r}: expected true or false")


def parse_timestamp(text: str) -> int:
    """mqadmin's -s/-b/-e forms: 'now', epoch milliseconds, 'yyyy-MM-dd#HH:mm:ss:SSS', or ISO 8601."""
    t = str(text).strip()
    if t.lower() == "now":
        return int(time.time() * 1000)
    if t.lstrip("-").isdigit():
        return int(t)
    for fmt in ("%Y-%m-%d#%H:%M:%S:%f", "%Y-%m-%d#%H:%M:%S"):
        try:
            dt = datetime.datetime.strptime(t, fmt)
            return int(dt.timestamp() * 1000)
        except ValueError:
            pass
    try:
        return int(datetime.datetime.fromisoformat(t).timestamp() * 1000)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad timestamp {text!r}: expected 'now', epoch milliseconds, yyyy-MM-dd#HH:mm:ss:SSS or ISO 8601") from None


def broker_targets(admin, args) -> list[str]:
    """The broker addresses a -b / -c command works on (exactly one of them must be given)."""
    if getattr(args, "brokerAddr", None):
        addr = args.brokerAddr
        if addr not in {b.addr for b in admin.brokers()}:
            raise UsageError(f"broker {addr} is not registered in the name server")
        return [addr]
    if getattr(args, "clusterName", None):
        return admin.master_addrs(args.clusterName)
    raise UsageError("give a broker address (-b HOST:PORT) or a cluster name (-c CLUSTER)")

