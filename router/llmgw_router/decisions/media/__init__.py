"""Pure decisions of the requests that are not text: a speech request's multipart form, an images request's
workflow. Values in, values out, as the rest of decisions/."""
