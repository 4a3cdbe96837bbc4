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

And moto's transactions copy every table they touch (to put it back if one action fails), so a
commit costs what its tables hold (22 ms at 100 items, 250 ms at 3,000, 570 ms at 6,000, which
served one at a time stalls every renewal behind it). Here a transaction checks every condition
before it writes anything and keeps copies of the items it writes only (6 to 12 ms at any table
size), as DynamoDB's cost what they write. Should a later moto move what this replaces, its own
transactions are kept (still served one at a time), and the log says so.

Arguments are moto_server's.
"""

import copy
import sys
import threading

import moto.server as server

try:
    from moto.dynamodb.comparisons import get_filter_expression
    from moto.dynamodb.exceptions import (
        ConditionalCheckFailed,
        MultipleTransactionsException,
        TooManyTransactionsException,
        TransactionCanceledException,
        TransactWriteSingleOpException,
    )
    from moto.dynamodb.models import DynamoDBBackend
except ImportError as missing:  # a moto that moved them: its own transactions, serialized
    print(f"moto_serial: moto's own transactions kept ({missing})", file=sys.stderr)
    DynamoDBBackend = None

def key_of(backend, op_type, op):
    """The key of the item an action writes."""
    if op_type != "Put":
        return op["Key"]
    table = backend.get_table(op["TableName"])
    attrs = op["Item"]
    key = {table.hash_key_attr: attrs[table.hash_key_attr]}
    if table.range_key_attr is not None:
        key[table.range_key_attr] = attrs[table.range_key_attr]
    return key


def verdict(backend, op, current):
    """(code, message, item) of an action's condition, as moto reports it."""
    condition = op.get("ConditionExpression")
    if condition is None:
        return (None, None, None)
    names = op.get("ExpressionAttributeNames")
    values = op.get("ExpressionAttributeValues")
    if get_filter_expression(condition, names, values).expr(current):
        return (None, None, None)
    item = None
    if op.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD" and current:
        item = current.to_json()["Attributes"]
    failed = ConditionalCheckFailed(item=item)
    return ("ConditionalCheckFailed", str(failed.message), item)


def apply(backend, op_type, op, key):
    names = op.get("ExpressionAttributeNames")
    values = op.get("ExpressionAttributeValues")
    if op_type == "Put":
        backend.put_item(op["TableName"], op["Item"])
    elif op_type == "Delete":
        backend.delete_item(op["TableName"], key)
    elif op_type == "Update":
        backend.update_item(
            op["TableName"],
            key,
            update_expression=op["UpdateExpression"],
            expression_attribute_names=names,
            expression_attribute_values=values,
        )


def transact_write_items(self, transact_items):
    """Every condition checked, then every action applied; nothing of it if one fails."""
    if len(transact_items) > 100:
        raise TooManyTransactionsException()
    seen, plan, errors = set(), [], []
    for item in transact_items:
        if len(list(item.keys())) > 1:
            raise TransactWriteSingleOpException
        op_type, op = next(iter(item.items()))
        if op_type not in {"ConditionCheck", "Put", "Delete", "Update"}:
            errors.append(("ValueError", "Unsupported transaction operation", None))
            continue
        key = key_of(self, op_type, op)
        unique = (str(op["TableName"]), str(dict(sorted(key.items()))))
        if unique in seen:
            raise MultipleTransactionsException()
        seen.add(unique)
        current = self.get_item(op["TableName"], key)
        try:
            errors.append(verdict(self, op, current))
        except Exception as e:  # noqa: BLE001 as moto reports any other failure
            errors.append((type(e).__name__, str(e), None))
        plan.append((op_type, op, key, copy.deepcopy(current)))
    if any(code is not None for code, _, _ in errors):
        raise TransactionCanceledException(errors)
    applied = []
    try:
        for op_type, op, key, before in plan:
            if op_type == "ConditionCheck":
                continue
            applied.append((op["TableName"], key, before))
            apply(self, op_type, op, key)
    except Exception:
        for table, key, before in reversed(applied):
            if before is None:
                self.delete_item(table, key)
            else:
                self.put_item(table, before.to_json()["Attributes"])
        raise


if DynamoDBBackend is not None:
    DynamoDBBackend.transact_write_items = transact_write_items

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
