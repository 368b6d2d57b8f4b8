"""Make journal entries and postings append-only in PostgreSQL itself.

The services never update or delete them; this trigger makes sure nothing else does
either (a stray UPDATE in a shell, a bug in a future service). Corrections are
reversing entries. TRUNCATE, used by test teardown, is not affected.
"""

from django.db import migrations

FORBID = """
CREATE OR REPLACE FUNCTION ledger_forbid_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the ledger is append-only: % on % is not allowed',
        TG_OP, TG_TABLE_NAME;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER ledger_journalentry_append_only
    BEFORE UPDATE OR DELETE ON ledger_journalentry
    FOR EACH ROW EXECUTE FUNCTION ledger_forbid_change();
CREATE TRIGGER ledger_posting_append_only
    BEFORE UPDATE OR DELETE ON ledger_posting
    FOR EACH ROW EXECUTE FUNCTION ledger_forbid_change();
"""

ALLOW = """
DROP TRIGGER IF EXISTS ledger_posting_append_only ON ledger_posting;
DROP TRIGGER IF EXISTS ledger_journalentry_append_only ON ledger_journalentry;
DROP FUNCTION IF EXISTS ledger_forbid_change();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        # No params: psycopg then leaves the RAISE format marks (%) alone.
        schema_editor.execute(FORBID, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ALLOW)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0001_initial")]
    operations = [migrations.RunPython(forward, backward)]
