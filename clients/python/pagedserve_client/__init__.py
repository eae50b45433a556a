"""Python client for pagedserve, protocol v1 over ZeroMQ (docs/protocol.md).

Installed with ``pip install clients/python`` (distribution ``pagedserve-client``,
needs pyzmq), or used from a checkout with ``clients/python`` on ``sys.path``;
either way the import is ``import pagedserve_client``. See ``client.py`` for the
full example and ``Client`` for the API.
"""

from .client import (DEFAULT_ENDPOINT, PROTOCOL_VERSION, Client, Delta, Final, Output,
                     PagedServeError, PagedServeTimeout, Stream, TokenLogprob, load_certificate)

__version__ = "0.1.0"

__all__ = ["Client", "Stream", "Delta", "Final", "Output", "TokenLogprob", "PagedServeError",
           "PagedServeTimeout", "PROTOCOL_VERSION", "DEFAULT_ENDPOINT", "load_certificate",
           "__version__"]
