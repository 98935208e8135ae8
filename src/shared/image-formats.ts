// The image formats a job's output is shown and served as an image in: raster
// formats a browser draws in <img> and never runs as a document (an SVG, say,
// is one). Shared by the service (GET /api/jobs/{id}/output/raw) and the
// console's preview.

/** Lowercase format names, as a job's output `format` gives them. */
export const RASTER_IMAGE_FORMATS: ReadonlySet<string> = new Set(["png", "jpeg", "jpg", "gif", "webp", "avif", "bmp"]);

/** The media type of a raster format, or undefined for any other. */
export function rasterImageType(format: string): string | undefined {
  const f = format.toLowerCase();
  if (!RASTER_IMAGE_FORMATS.has(f)) return undefined;
  return `image/${f === "jpg" ? "jpeg" : f}`;
}
