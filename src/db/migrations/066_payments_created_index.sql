-- The operator's payment list unfiltered (GET /api/admin/payments), newest
-- first: without an index in its order every page sorted every payment ever
-- made (the renter's and the status indexes lead with their column). Read
-- along this one, a page costs its offset and its rows.
CREATE INDEX payments_created_idx ON payments (created_at DESC, id DESC);
