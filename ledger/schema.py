"""Schema changes that a live database takes without stopping its writers."""

from django.contrib.postgres.operations import (
    AddConstraintNotValid,
    AddIndexConcurrently,
    RemoveIndexConcurrently,
)
from django.db.migrations import AddConstraint, AddIndex, RemoveIndex


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


class AddCheckOnline(AddConstraintNotValid):
    """`AddConstraint` of a check that lets reads and writes go on while the rows
    are checked: on PostgreSQL the constraint is added `NOT VALID` (a moment's
    lock; new rows are checked from then on), then `VALIDATE CONSTRAINT` reads the
    old ones under a lock that blocks no INSERT or UPDATE. A plain `ADD CONSTRAINT`
    holds every read and write of the table off until it has read every row.
    Elsewhere a plain one. Its migration must say `atomic = False` (in one
    transaction the first lock would be held through the check).
    """

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            AddConstraint.database_forwards(
                self, app_label, schema_editor, from_state, to_state
            )
            return
        super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        quote = schema_editor.quote_name
        schema_editor.execute(
            f"ALTER TABLE {quote(model._meta.db_table)} "
            f"VALIDATE CONSTRAINT {quote(self.constraint.name)}"
        )


def _way(schema_editor, online: type = AddIndexConcurrently, plain: type = AddIndex):
    if schema_editor.connection.vendor == "postgresql":
        return online
    return plain
