"""The port a listening server got, on asyncio's event loop or uvloop's.

asyncio's ``Server.sockets`` is a tuple and uvloop's a list; typeshed says tuple, and a module
mypyc compiled checks a declared tuple at run time (setup.py). This module stays pure Python,
so the compiled servers read the port through it.
"""

import asyncio


def listening_port(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])
