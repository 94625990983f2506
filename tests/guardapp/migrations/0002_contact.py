from __future__ import annotations


from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("guardapp", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Contact",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=100)),
                ("email", models.CharField(blank=True, db_column="Email", max_length=200)),
            ],
            options={
                "db_table": "GuardApp_Contact",
            },
        ),
    ]
