// The image formats a job's output is shown and served as an image in: raster
// formats a browser draws in <img> and never runs as a document (an SVG, say,
// is one). Shared by the service (GET /api/jobs/{id}/output/raw), the
// console's preview and download, and the file svc writes an output to.

/** Lowercase format names, as a job's output `format` gives them. */
export const RASTER_IMAGE_FORMATS: ReadonlySet<string> = new Set(["png", "jpeg", "jpg", "gif", "webp", "avif", "bmp"]);

/** The media type of a raster format, or undefined for any other. */
export function rasterImageType(format: string): string | undefined {
  const f = format.toLowerCase();
  if (!RASTER_IMAGE_FORMATS.has(f)) return undefined;
  return `image/${f === "jpg" ? "jpeg" : f}`;
}

/** What an output of a format that is not a raster image is saved and offered as: opaque bytes. */
export const OPAQUE_EXTENSION = "bin";
export const OPAQUE_TYPE = "application/octet-stream";

/**
 * The file extension an image output of `format` (the provider's word) is saved under: a raster
 * format's own name; for any other, `bin`, so that a provider cannot choose a file type that opens
 * as a document or runs as a program (html, svg, hta, exe, desktop …) when the renter opens the file.
 */
export function outputFileExtension(format: string): string {
  const f = format.toLowerCase();
  return RASTER_IMAGE_FORMATS.has(f) ? f : OPAQUE_EXTENSION;
}

/** The media type an image output of `format` is offered as: its raster type, else application/octet-stream. */
export function outputFileType(format: string): string {
  return rasterImageType(format) ?? OPAQUE_TYPE;
}
