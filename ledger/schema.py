"""Schema changes that a live database takes without stopping its writers."""

from django.contrib.postgres.operations import (
    AddIndexConcurrently,
    RemoveIndexConcurrently,
)
from django.db.migrations import AddIndex, RemoveIndex


class AddIndexOnline(AddIndexConcurrently):
    """`AddIndex` that lets writes go on while the index builds: `CREATE INDEX
    CONCURRENTLY` on PostgreSQL (a plain CREATE INDEX holds off every INSERT and
    UPDATE of the table until it is built: minutes for a table of payments), a plain
    one elsewhere (SQLite, embedded: one process, a small table). Its migration must
    say `atomic = False`.
    """

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        way = _way(schema_editor)
        way.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        way = _way(schema_editor)
        way.database_backwards(self, app_label, schema_editor, from_state, to_state)


class RemoveIndexOnline(RemoveIndexConcurrently):
    """`RemoveIndex` that lets writes go on while the index is dropped: `DROP INDEX
    CONCURRENTLY` on PostgreSQL, a plain one elsewhere. Its migration must say
    `atomic = False`.
    """

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        way = _way(schema_editor, RemoveIndexConcurrently, RemoveIndex)
        way.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        way = _way(schema_editor, RemoveIndexConcurrently, RemoveIndex)
        way.database_backwards(self, app_label, schema_editor, from_state, to_state)


def _way(schema_editor, online: type = AddIndexConcurrently, plain: type = AddIndex):
    if schema_editor.connection.vendor == "postgresql":
        return online
    return plain
