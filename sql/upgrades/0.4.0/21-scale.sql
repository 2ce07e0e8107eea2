-- Issue 21 (scale, measured): list_content reads a page of a site's items in its own order
-- (created_at, id, newest first) from an index, so its time does not grow with the site; without
-- it a site of 100,000 items sorted them all for every page (docs/performance.md, "Scale").
CREATE INDEX content_items_site_created ON querylayer.content_items (site_id, created_at DESC, id DESC);
