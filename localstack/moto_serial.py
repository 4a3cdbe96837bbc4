"""moto server with its DynamoDB requests served one at a time.

moto runs a TransactWriteItems against the live tables and, when it cancels one, puts back a
copy of every table the transaction touched, taken when it began and without a lock. moto
serves requests on several threads, so any write that landed meanwhile on one of those tables
(another worker's renewal, another shard's commit) is silently undone, and a cancelled
transaction's own writes can come back. DynamoDB isolates transactions (serializable against
other writes). Serving DynamoDB requests one at a time restores that: a transaction, cancelled
or not, sees no write land beside it. SQS and S3 requests (long polls among them) stay
concurrent. Python's lock already served moto's handlers one at a time for CPU, so the cost
is small.

Arguments are moto_server's.
"""

import threading

import moto.server as server

_dynamodb = threading.Lock()
_serve = server.DomainDispatcherApplication.__call__


def _call(self, environ, start_response):
    if environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB"):
        with _dynamodb:
            # The whole answer is worked out under the lock, not only its first bytes.
            return list(_serve(self, environ, start_response))
    return _serve(self, environ, start_response)


server.DomainDispatcherApplication.__call__ = _call

if __name__ == "__main__":
    server.main()
