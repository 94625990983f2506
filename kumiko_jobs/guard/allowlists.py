"""Data for the DB guard: which built-in functions and catalog relations a tenant run may use.

Pure data, no logic. Everything here is an ALLOWLIST on purpose: volatility and "it only
reads" are no guide (``table_to_xml`` is STABLE and dumps another tenant's table; ``ts_stat``
runs SQL text; ``pg_stat_get_*`` hands out other sessions' counters). A function that is not
listed needs the ``unsafe_raw`` grant, unless ``KUMIKO_JOBS["GUARD_EXTRA_FUNCTIONS"]`` lists it
or it lives in a ``PG_EXTRA_SEARCH_PATHS`` schema.

Names are those PostgreSQL resolves in ``pg_catalog``; the SQL syntax forms that the parser
turns into calls (``EXTRACT`` -> ``extract``, ``AT TIME ZONE`` -> ``timezone``, ``TRIM`` ->
``btrim``, ``SUBSTRING`` -> ``substring``, ``SIMILAR TO`` -> ``similar_to_escape``, ...) are
listed under the name the parser produces.
"""

from __future__ import annotations


def _words(*texts: str) -> frozenset[str]:
    return frozenset(" ".join(texts).split())


_MATH = """
abs cbrt ceil ceiling degrees div erf erfc exp factorial floor gamma lgamma gcd lcm ln log
log10 min_scale mod pi power pow radians round scale sign sqrt trim_scale trunc width_bucket
random random_normal acos acosd asin asind atan atand atan2 atan2d cos cosd cot cotd sin sind
tan tand sinh cosh tanh asinh acosh atanh bit_count int2 int4 int8 float4 float8 numeric
num_nulls num_nonnulls
"""
_STRING = """
ascii bit_length btrim ltrim rtrim char_length character_length chr concat concat_ws format
initcap left length lower lpad md5 normalize is_normalized octet_length overlay position
quote_ident quote_literal quote_nullable regexp_count regexp_instr regexp_like regexp_match
regexp_matches regexp_replace regexp_split_to_array regexp_split_to_table regexp_substr repeat
replace reverse right rpad split_part starts_with string_to_array string_to_table strpos substr
substring to_ascii to_hex to_bin to_oct translate unistr upper casefold unicode_assigned
encode decode convert_from convert_to sha224 sha256 sha384 sha512 crc32 crc32c get_byte
set_byte get_bit set_bit text varchar bpchar like_escape similar_to_escape similar_escape
textlike texticlike textnlike texticnlike textcat texteq textne bool uuid
"""
_DATETIME = """
age clock_timestamp date_add date_subtract date_bin date_part date_trunc extract isfinite
justify_days justify_hours justify_interval make_date make_interval make_time make_timestamp
make_timestamptz now statement_timestamp timeofday transaction_timestamp to_char to_date
to_number to_timestamp timezone overlaps date time timetz timestamp timestamptz interval
generate_series
"""
_JSON = """
to_json to_jsonb array_to_json row_to_json json_build_array jsonb_build_array json_build_object
jsonb_build_object json_object jsonb_object json_agg jsonb_agg json_agg_strict jsonb_agg_strict
json_object_agg jsonb_object_agg json_object_agg_strict jsonb_object_agg_strict
json_object_agg_unique jsonb_object_agg_unique json_object_agg_unique_strict
jsonb_object_agg_unique_strict json_array_elements jsonb_array_elements
json_array_elements_text jsonb_array_elements_text json_array_length jsonb_array_length
json_each jsonb_each json_each_text jsonb_each_text json_extract_path jsonb_extract_path
json_extract_path_text jsonb_extract_path_text json_object_keys jsonb_object_keys
json_populate_record jsonb_populate_record jsonb_populate_record_valid json_populate_recordset
jsonb_populate_recordset json_to_record jsonb_to_record json_to_recordset jsonb_to_recordset
json_strip_nulls jsonb_strip_nulls jsonb_set jsonb_set_lax jsonb_insert jsonb_pretty
json_typeof jsonb_typeof jsonb_path_exists jsonb_path_match jsonb_path_query
jsonb_path_query_array jsonb_path_query_first jsonb_path_exists_tz jsonb_path_match_tz
jsonb_path_query_tz jsonb_path_query_array_tz jsonb_path_query_first_tz jsonb_concat
jsonb_contains jsonb_contained jsonb_exists jsonb_exists_any jsonb_exists_all jsonb_delete
jsonb_delete_path json jsonb
"""
_ARRAY_RANGE = """
array_append array_cat array_dims array_fill array_length array_lower array_ndims
array_position array_positions array_prepend array_remove array_replace array_sample
array_shuffle array_to_string array_upper array_reverse array_sort cardinality trim_array unnest
generate_subscripts arraycontains arraycontained arrayoverlap isempty lower_inc upper_inc
lower_inf upper_inf range_merge multirange int4range int8range numrange tsrange tstzrange
daterange int4multirange int8multirange nummultirange tsmultirange tstzmultirange
datemultirange range_agg range_intersect_agg
"""
_AGGREGATE_WINDOW = """
count sum avg min max array_agg string_agg bool_and bool_or every bit_and bit_or bit_xor stddev
stddev_pop stddev_samp variance var_pop var_samp corr covar_pop covar_samp regr_avgx regr_avgy
regr_count regr_intercept regr_r2 regr_slope regr_sxx regr_sxy regr_syy mode percentile_cont
percentile_disc any_value row_number rank dense_rank percent_rank cume_dist ntile lag lead
first_value last_value nth_value
"""
# Full-text search that does not run SQL text (ts_stat and the two-argument ts_rewrite do).
_TEXT_SEARCH = """
to_tsvector to_tsquery plainto_tsquery phraseto_tsquery websearch_to_tsquery ts_rank ts_rank_cd
ts_headline setweight strip numnode querytree tsvector_to_array array_to_tsvector ts_delete
ts_filter tsquery_phrase get_current_ts_config json_to_tsvector jsonb_to_tsvector
"""
_NETWORK_UUID_MISC = """
abbrev broadcast family host hostmask masklen netmask network set_masklen inet_merge
inet_same_family gen_random_uuid uuidv4 uuidv7 uuid_extract_timestamp uuid_extract_version
current_setting current_schema current_schemas current_database version pg_typeof
pg_column_size format_type txid_current pg_current_xact_id hashtext hashtextextended
pg_collation_for system_user xmlcomment xmlexists xpath xpath_exists xml_is_well_formed
xml_is_well_formed_document
xml_is_well_formed_content
"""
# What Django's introspection (connection.introspection.get_table_list, get_constraints, ...)
# calls. They decompile definitions (an index, a column default), which django-tenants creates
# from the same migrations in every tenant; they return no table rows. pg_get_viewdef,
# pg_get_functiondef, pg_get_triggerdef, pg_get_ruledef, pg_get_constraintdef and friends are
# NOT listed: Django does not need them, and a function body or view can embed literals.
_INTROSPECTION = "pg_table_is_visible obj_description col_description pg_get_expr pg_get_indexdef"

# Sequences: the first argument names a sequence and is resolved like a relation name.
SEQUENCE_FUNCTIONS = frozenset({"nextval", "currval", "setval"})
# Transaction-level advisory locks: released at the end of the transaction, so they cannot
# outlive a run. The session-level ones (pg_advisory_lock, pg_advisory_unlock*, pg_try_advisory_
# lock*) are not listed: they do.
ADVISORY_XACT_LOCKS = frozenset(
    {
        "pg_advisory_xact_lock",
        "pg_advisory_xact_lock_shared",
        "pg_try_advisory_xact_lock",
        "pg_try_advisory_xact_lock_shared",
    }
)

BUILTIN_FUNCTIONS = (
    _words(_MATH, _STRING, _DATETIME, _JSON, _ARRAY_RANGE, _AGGREGATE_WINDOW, _TEXT_SEARCH)
    | _words(_NETWORK_UUID_MISC, _INTROSPECTION)
    | SEQUENCE_FUNCTIONS
    | ADVISORY_XACT_LOCKS
)

# Casts to these types turn a string into an object id by resolving it as a name, so the string
# is judged like the name it spells. regrole names a role (no schema): harmless.
REG_TYPES = frozenset(
    {
        "regclass", "regproc", "regprocedure", "regoper", "regoperator", "regtype",
        "regnamespace", "regrole", "regconfig", "regdictionary", "regcollation",
    }
)  # fmt: skip

# Relations and views of pg_catalog in PostgreSQL 15 to 18 (queried from 15, plus what 16-18
# added). PostgreSQL searches pg_catalog before the search path, so an unqualified ``pg_class``
# is the catalog, never a tenant table; any other unqualified ``pg_*`` name is treated as a
# catalog name too (conservatively: a future version may add it).
CATALOG_RELATIONS = _words(
    """
pg_aggregate pg_am pg_amop pg_amproc pg_attrdef pg_attribute pg_auth_members pg_authid
pg_available_extension_versions pg_available_extensions pg_backend_memory_contexts pg_cast
pg_class pg_collation pg_config pg_constraint pg_conversion pg_cursors pg_database
pg_db_role_setting pg_default_acl pg_depend pg_description pg_enum pg_event_trigger
pg_extension pg_file_settings pg_foreign_data_wrapper pg_foreign_server pg_foreign_table
pg_group pg_hba_file_rules pg_ident_file_mappings pg_index pg_indexes pg_inherits
pg_init_privs pg_language pg_largeobject pg_largeobject_metadata pg_locks pg_matviews
pg_namespace pg_opclass pg_operator pg_opfamily pg_parameter_acl pg_partitioned_table
pg_policies pg_policy pg_prepared_statements pg_prepared_xacts pg_proc pg_publication
pg_publication_namespace pg_publication_rel pg_publication_tables pg_range
pg_replication_origin pg_replication_origin_status pg_replication_slots pg_rewrite pg_roles
pg_rules pg_seclabel pg_seclabels pg_sequence pg_sequences pg_settings pg_shadow pg_shdepend
pg_shdescription pg_shmem_allocations pg_shseclabel pg_stat_activity pg_stat_all_indexes
pg_stat_all_tables pg_stat_archiver pg_stat_bgwriter pg_stat_database
pg_stat_database_conflicts pg_stat_gssapi pg_stat_progress_analyze
pg_stat_progress_basebackup pg_stat_progress_cluster pg_stat_progress_copy
pg_stat_progress_create_index pg_stat_progress_vacuum pg_stat_recovery_prefetch
pg_stat_replication pg_stat_replication_slots pg_stat_slru pg_stat_ssl pg_stat_subscription
pg_stat_subscription_stats pg_stat_sys_indexes pg_stat_sys_tables pg_stat_user_functions
pg_stat_user_indexes pg_stat_user_tables pg_stat_wal pg_stat_wal_receiver
pg_stat_xact_all_tables pg_stat_xact_sys_tables pg_stat_xact_user_functions
pg_stat_xact_user_tables pg_statio_all_indexes pg_statio_all_sequences pg_statio_all_tables
pg_statio_sys_indexes pg_statio_sys_sequences pg_statio_sys_tables pg_statio_user_indexes
pg_statio_user_sequences pg_statio_user_tables pg_statistic pg_statistic_ext
pg_statistic_ext_data pg_stats pg_stats_ext pg_stats_ext_exprs pg_subscription
pg_subscription_rel pg_tables pg_tablespace pg_timezone_abbrevs pg_timezone_names
pg_transform pg_trigger pg_ts_config pg_ts_config_map pg_ts_dict pg_ts_parser pg_ts_template
pg_type pg_user pg_user_mapping pg_user_mappings pg_views
pg_stat_io pg_stat_checkpointer pg_wait_events pg_aios pg_shmem_allocations_numa
pg_dsm_registry_allocations
"""
)

# Catalog relations a tenant run may read: object definitions (which tables, columns, types,
# indexes and constraints exist), what Django's introspection and ordinary code read. In
# django-tenants every tenant has the same definitions (the same migrations), so these tell a
# run nothing about another tenant's rows.
#
# Everything else in pg_catalog is denied, whatever the grants, because it hands out VALUES of
# other tenants or other sessions, and cross_tenant_reads (scoped to one tenant) cannot cover
# "every tenant at once": pg_stats / pg_statistic* (histograms and most common values of every
# tenant's columns), pg_stat_activity (other sessions' query text with inline literals),
# pg_stat_statements, pg_stat_* / pg_statio_* (row counts per tenant table), pg_sequences
# (last_value of every tenant's sequences), pg_locks (other sessions' lock keys),
# pg_prepared_statements / pg_cursors (statement text left on the connection), pg_authid /
# pg_shadow / pg_user_mapping(s) (credentials), pg_largeobject (contents), pg_hba_file_rules,
# pg_file_settings, pg_config, pg_replication_*, pg_backend_memory_contexts.
READABLE_CATALOG_RELATIONS = _words(
    """
pg_aggregate pg_am pg_amop pg_amproc pg_attrdef pg_attribute pg_cast pg_class pg_collation
pg_constraint pg_conversion pg_depend pg_description pg_enum pg_event_trigger pg_extension
pg_available_extensions pg_available_extension_versions pg_foreign_table pg_index pg_indexes
pg_inherits pg_language pg_matviews pg_namespace pg_opclass pg_operator pg_opfamily
pg_partitioned_table pg_policy pg_policies pg_proc pg_range pg_rewrite pg_rules pg_sequence
pg_settings pg_statistic_ext pg_tables pg_tablespace pg_timezone_abbrevs pg_timezone_names
pg_transform pg_trigger pg_ts_config pg_ts_config_map pg_ts_dict pg_ts_parser pg_ts_template
pg_type pg_views pg_roles pg_database
"""
)

# Columns of the readable catalog relations above that hold another tenant's VALUES rather than
# definitions every tenant shares (issue 22): planner statistics (row counts and sizes of every
# tenant's tables: the reason pg_stat_* is refused), and the text of functions, views, rules,
# triggers and policies, which may embed literals. A statement reading one of these relations
# may not name such a column (in any clause: a WHERE or ORDER BY on reltuples is an oracle),
# expand it (``*``, ``c.*``, a whole-row ``c``, ``NATURAL JOIN``, ``USING``, column aliases).
# Django's introspection reads none of them; it reads column defaults, constraints and indexes
# (adbin, conbin, indexprs, which migrations create alike in every tenant).
RESTRICTED_CATALOG_COLUMNS: dict[str, frozenset[str]] = {
    "pg_class": _words("reltuples relpages relallvisible relallfrozen"),
    "pg_proc": _words("prosrc probin prosqlbody proargdefaults"),
    "pg_rewrite": _words("ev_action ev_qual"),
    "pg_trigger": _words("tgargs tgqual"),
    "pg_policy": _words("polqual polwithcheck"),
    "pg_policies": _words("qual with_check"),
    "pg_aggregate": _words("agginitval aggminitval"),
    "pg_views": _words("definition"),
    "pg_matviews": _words("definition"),
    "pg_rules": _words("definition"),
}
RESTRICTED_INFORMATION_SCHEMA_COLUMNS: dict[str, frozenset[str]] = {
    "routines": _words("routine_definition"),
    "views": _words("view_definition"),
    "triggers": _words("action_statement action_condition"),
    # A foreign server's user mappings and options hold credentials (pg_user_mappings by
    # another name); a function parameter's default is pg_proc.proargdefaults.
    "user_mapping_options": _words("option_value"),
    "foreign_server_options": _words("option_value"),
    "foreign_data_wrapper_options": _words("option_value"),
    "foreign_table_options": _words("option_value"),
    "parameters": _words("parameter_default"),
}

# Functions that hand out the same values (definitions, sizes, statistics counters): refused
# whatever the grants, like the catalog relations above (rule ``catalog``), and so are all
# ``pg_stat_get_*`` (walker). pg_get_indexdef and pg_get_expr stay allowed: Django's
# introspection calls them, on definitions the migrations create alike in every tenant.
CATALOG_VALUE_FUNCTIONS = _words(
    """
pg_get_viewdef pg_get_functiondef pg_get_function_arguments pg_get_function_sqlbody
pg_get_ruledef pg_get_triggerdef pg_get_constraintdef pg_get_partkeydef
pg_get_partition_constraintdef pg_get_statisticsobjdef pg_get_statisticsobjdef_columns
pg_get_statisticsobjdef_expressions pg_relation_size pg_total_relation_size pg_table_size
pg_indexes_size pg_database_size pg_tablespace_size pg_stat_have_stats
"""
)
CATALOG_VALUE_FUNCTION_PREFIX = "pg_stat_get_"
