"""Make stock movements append-only in PostgreSQL itself, like the ledger's journal.

A product's stock is the sum of its movements; a movement edited or deleted behind
the services' back would make that unprovable. Corrections are new movements.
TRUNCATE, used by test teardown, is not affected.
"""

from django.db import migrations

FORBID = """
CREATE OR REPLACE FUNCTION orders_stockmovement_forbid_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'stock movements are append-only: % on % is not allowed',
        TG_OP, TG_TABLE_NAME;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER orders_stockmovement_append_only
    BEFORE UPDATE OR DELETE ON orders_stockmovement
    FOR EACH ROW EXECUTE FUNCTION orders_stockmovement_forbid_change();
"""

ALLOW = """
DROP TRIGGER IF EXISTS orders_stockmovement_append_only ON orders_stockmovement;
DROP FUNCTION IF EXISTS orders_stockmovement_forbid_change();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        # No params: psycopg then leaves the RAISE format marks (%) alone.
        schema_editor.execute(FORBID, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ALLOW)


class Migration(migrations.Migration):
    dependencies = [("orders", "0002_products_and_stock")]
    operations = [migrations.RunPython(forward, backward)]
