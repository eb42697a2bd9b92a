/* SPDX-License-Identifier: MIT */
/* tiers/tier.c — dispatch through the vtable, counting as it goes. */
#include "tiers/tier.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int tier_put(struct tier *t, struct tier_io *io, const struct tier_meta *m,
	     const void *src, struct tier_obj **out)
{
	int rc;

	if (!t || !m || !src || !out || m->len == 0)
		return -EINVAL;
	rc = t->ops->put(t, io, m, src, out);
	atomic_fetch_add(&t->st.puts, 1);
	if (rc)
		atomic_fetch_add(&t->st.put_errors, 1);
	else
		atomic_fetch_add(&t->st.bytes_in, m->len);
	return rc;
}

int tier_putv(struct tier *t, struct tier_io *io, const struct tier_meta *m,
	      const void *const *src, unsigned n, struct tier_obj **out,
	      int *rcs)
{
	int first = 0;

	if (!t || (n && (!m || !src || !out || !rcs)))
		return -EINVAL;
	for (unsigned i = 0; i < n; i++)
		if (!src[i] || m[i].len == 0)
			return -EINVAL;
	if (!t->ops->putv) {
		for (unsigned i = 0; i < n; i++) {
			rcs[i] = tier_put(t, io, &m[i], src[i], &out[i]);
			if (rcs[i] && !first)
				first = rcs[i];
		}
		return first;
	}
	first = t->ops->putv(t, io, m, src, n, out, rcs);
	for (unsigned i = 0; i < n; i++) {
		atomic_fetch_add(&t->st.puts, 1);
		if (rcs[i])
			atomic_fetch_add(&t->st.put_errors, 1);
		else
			atomic_fetch_add(&t->st.bytes_in, m[i].len);
	}
	return first;
}

int tier_getv(struct tier *t, struct tier_io *io, struct tier_obj **o,
	      void **dst, const size_t *cap, unsigned n, int64_t *res)
{
	int first = 0;

	if (!t || (n && (!o || !dst || !cap || !res)))
		return -EINVAL;
	for (unsigned i = 0; i < n; i++)
		if (!o[i] || !dst[i])
			return -EINVAL;
	if (!t->ops->getv) {
		for (unsigned i = 0; i < n; i++) {
			res[i] = tier_get(t, io, o[i], dst[i], cap[i]);
			if (res[i] < 0 && !first)
				first = (int)res[i];
		}
		return first;
	}
	first = t->ops->getv(t, io, o, dst, cap, n, res);
	for (unsigned i = 0; i < n; i++) {
		atomic_fetch_add(&t->st.gets, 1);
		if (res[i] < 0)
			atomic_fetch_add(&t->st.get_errors, 1);
		else
			atomic_fetch_add(&t->st.bytes_out, (uint64_t)res[i]);
	}
	return first;
}

int64_t tier_get(struct tier *t, struct tier_io *io, struct tier_obj *o,
		 void *dst, size_t cap)
{
	int64_t rc;

	if (!t || !o || !dst)
		return -EINVAL;
	rc = t->ops->get(t, io, o, dst, cap);
	atomic_fetch_add(&t->st.gets, 1);
	if (rc < 0)
		atomic_fetch_add(&t->st.get_errors, 1);
	else
		atomic_fetch_add(&t->st.bytes_out, (uint64_t)rc);
	return rc;
}

int64_t tier_gather(struct tier *t, struct tier_io *io, struct tier_obj *o,
		    const struct tier_range *r, unsigned n, void *dst)
{
	int64_t rc;

	if (!t || !o || (!r && n) || !dst)
		return -EINVAL;
	for (unsigned i = 0; i < n; i++)
		if (r[i].off > o->meta.len || r[i].len > o->meta.len - r[i].off)
			return -EINVAL;
	if (t->ops->gather) {
		rc = t->ops->gather(t, io, o, r, n, dst);
	} else {
		/* Whole payload, then pick the ranges out of it. */
		char *tmp = malloc(o->meta.len);
		char *d = dst;

		if (!tmp)
			return -ENOMEM;
		rc = t->ops->get(t, io, o, tmp, o->meta.len);
		if (rc >= 0 && (uint64_t)rc != o->meta.len)
			rc = -EIO;
		if (rc >= 0) {
			rc = 0;
			for (unsigned i = 0; i < n; i++) {
				memcpy(d, tmp + r[i].off, r[i].len);
				d += r[i].len;
				rc += (int64_t)r[i].len;
			}
		}
		free(tmp);
	}
	atomic_fetch_add(&t->st.gathers, 1);
	if (rc < 0)
		atomic_fetch_add(&t->st.get_errors, 1);
	else
		atomic_fetch_add(&t->st.bytes_out, (uint64_t)rc);
	return rc;
}

int64_t tier_gatherv(struct tier *t, struct tier_io *io,
		     const struct tier_gather_req *rq, unsigned n, void *dst)
{
	int64_t rc, tot = 0;
	char *d = dst;

	if (!t || (!rq && n) || !dst)
		return -EINVAL;
	for (unsigned i = 0; i < n; i++) {
		if (!rq[i].obj || (!rq[i].r && rq[i].n))
			return -EINVAL;
		for (unsigned k = 0; k < rq[i].n; k++)
			if (rq[i].r[k].off > rq[i].obj->meta.len ||
			    rq[i].r[k].len > rq[i].obj->meta.len - rq[i].r[k].off)
				return -EINVAL;
	}
	if (!t->ops->gatherv) {
		for (unsigned i = 0; i < n; i++) {
			rc = tier_gather(t, io, rq[i].obj, rq[i].r, rq[i].n, d);
			if (rc < 0)
				return rc;
			d += rc;
			tot += rc;
		}
		return tot;
	}
	rc = t->ops->gatherv(t, io, rq, n, dst);
	atomic_fetch_add(&t->st.gathers, 1);
	if (rc < 0)
		atomic_fetch_add(&t->st.get_errors, 1);
	else
		atomic_fetch_add(&t->st.bytes_out, (uint64_t)rc);
	return rc;
}

void *tier_addr(struct tier *t, struct tier_obj *o)
{
	if (!t || !o || !t->ops->addr)
		return NULL;
	return t->ops->addr(t, o);
}

void tier_drop(struct tier *t, struct tier_io *io, struct tier_obj *o)
{
	if (!t || !o)
		return;
	t->ops->drop(t, io, o);
	atomic_fetch_add(&t->st.drops, 1);
}

void tier_forget(struct tier *t, struct tier_obj *o)
{
	if (!t || !o)
		return;
	if (t->ops->forget)
		t->ops->forget(t, o);
	else
		t->ops->drop(t, NULL, o);
}

void tier_destroy(struct tier *t)
{
	if (t)
		t->ops->destroy(t);
}

void tier_get_stats(const struct tier *t, struct tier_stats *st)
{
	struct tier *m = (struct tier *)t;

	if (!t || !st)
		return;
	st->puts = atomic_load(&m->st.puts);
	st->gets = atomic_load(&m->st.gets);
	st->gathers = atomic_load(&m->st.gathers);
	st->drops = atomic_load(&m->st.drops);
	st->put_errors = atomic_load(&m->st.put_errors);
	st->get_errors = atomic_load(&m->st.get_errors);
	st->bytes_in = atomic_load(&m->st.bytes_in);
	st->bytes_out = atomic_load(&m->st.bytes_out);
}
