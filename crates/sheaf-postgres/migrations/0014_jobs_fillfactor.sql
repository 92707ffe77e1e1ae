-- The job table leaves a fifth of each page free (was 15 %, `0002_queue.sql`). The order columns
-- of `0012_job_order.sql` made every row 8 bytes longer (ten columns need a second byte of null
-- bitmap, and the header is padded to 32 bytes), so a page held fewer new row versions between
-- two prunings: claims and renewals, which must find room on their page to be HOT, fell from
-- 98 % HOT alone to 86 % beside other tests that held back pruning. 80 % gives the longer rows
-- the room the shorter ones had. It applies to pages written from now on.
ALTER TABLE jobs SET (fillfactor = 80);
