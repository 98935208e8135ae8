-- What a heartbeat batch hands the database, and how the telemetry is kept.
-- Reading a batch's rows (json_to_recordset) took about 30 µs a provider, most
-- of it converting members to jsonb: the telemetry object, parsed again into
-- jsonb's binary form on every beat, and the cached models, a jsonb array
-- unpacked into text[] per row. The batch now reads the models as text[]
-- directly, and the telemetry column is json: the text the server checked
-- and wrote, kept as it is. It is written thousands of times a second at
-- fleet scale and read whole (a provider's page, the admin dashboard); the
-- one reader of its members, a receipt's GPU facts, casts it once per
-- attempt that ends.
ALTER TABLE providers ALTER COLUMN gpu_telemetry TYPE json USING gpu_telemetry::json;

CREATE OR REPLACE FUNCTION provider_gpu_facts(pid bigint) RETURNS jsonb LANGUAGE sql STABLE AS $$
  SELECT jsonb_build_object(
    'model', coalesce(nullif(t->>'gpu_name', ''), p.gpu_model),
    'count', p.gpu_count,
    'vram_mib', coalesce(p.gpu_vram_mib, CASE WHEN jsonb_typeof(t->'gpu_vram_mib') = 'number'
                                              THEN (t->>'gpu_vram_mib')::numeric::bigint END),
    'driver_version', coalesce(p.gpu_driver_version, nullif(t->>'driver_version', '')),
    'uuids', coalesce((
      SELECT jsonb_agg(g->>'uuid' ORDER BY ord)
      FROM jsonb_array_elements(CASE WHEN jsonb_typeof(t->'all_gpus') = 'array' THEN t->'all_gpus' ELSE '[]'::jsonb END)
           WITH ORDINALITY AS x(g, ord)
      WHERE jsonb_typeof(g) = 'object' AND jsonb_typeof(g->'uuid') = 'string'), '[]'::jsonb))
  FROM providers p CROSS JOIN LATERAL (SELECT p.gpu_telemetry::jsonb AS t) tel
  WHERE p.id = pid
$$;
