//! The API's campaign list, paged by keyset (issue 24: 100,000 known campaigns).
//!
//! One statement picks the page first (filtered by status, after a cursor, in the page's
//! order, at most `limit`) and only then joins each campaign's totals and its rate over
//! the last 10 s, so a page reads `delivery_seconds` for its own campaigns only and costs
//! the same with 100 or 100,000 campaigns known. Without a limit it is the whole list.

use super::campaigns::{CampaignRow, CampaignStatus, CampaignSummary, COLUMNS};
use super::StoreError;
use chrono::{DateTime, Duration, Utc};
use sqlx::PgPool;

/// The largest page.
pub const MAX_PAGE: i64 = 1000;

/// The order of the list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ListOrder {
    /// By id.
    #[default]
    Id,
    /// Active campaigns first, then the others; by id within each group.
    ActiveFirst,
}

impl std::str::FromStr for ListOrder {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, StoreError> {
        match s {
            "id" => Ok(ListOrder::Id),
            "active_first" => Ok(ListOrder::ActiveFirst),
            other => Err(StoreError::invalid(
                "order",
                format!("unknown order {other:?}; expected id or active_first"),
            )),
        }
    }
}

/// Where a page starts: after `id`, in the page's order.
///
/// For [`ListOrder::ActiveFirst`] the cursor also says which group `id` was in when its
/// page was read. Looking its status up again instead would skip or repeat a whole
/// group's rest when that campaign's status changed between two pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub active: bool,
    pub id: String,
}

impl Cursor {
    /// The text the API hands out: the id, or for `active_first` `active:ID` / `other:ID`.
    pub fn to_text(&self, order: ListOrder) -> String {
        match (order, self.active) {
            (ListOrder::Id, _) => self.id.clone(),
            (ListOrder::ActiveFirst, true) => format!("active:{}", self.id),
            (ListOrder::ActiveFirst, false) => format!("other:{}", self.id),
        }
    }

    /// Reads [`Cursor::to_text`] back for `order`.
    pub fn parse(order: ListOrder, text: &str) -> Result<Cursor, StoreError> {
        let (active, id) = match order {
            ListOrder::Id => (false, text),
            ListOrder::ActiveFirst => match text.split_once(':') {
                Some(("active", id)) => (true, id),
                Some(("other", id)) => (false, id),
                _ => {
                    return Err(StoreError::invalid(
                        "after",
                        "with order=active_first, pass the x-next-after of the page before \
                         (active:ID or other:ID)",
                    ))
                }
            },
        };
        crate::job::check_id("after", id).map_err(|e| match e {
            crate::job::JobError::Field { problem, .. } => StoreError::invalid("after", problem),
            other => StoreError::invalid("after", other.to_string()),
        })?;
        Ok(Cursor {
            active,
            id: id.to_string(),
        })
    }
}

/// Which campaigns, in what order, how many.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// 1–[`MAX_PAGE`]; `None`: all of them.
    pub limit: Option<i64>,
    pub after: Option<Cursor>,
    pub status: Option<CampaignStatus>,
    pub order: ListOrder,
}

impl ListQuery {
    /// From the API's text values (`limit`, `after`, `status`, `order`), each checked and
    /// named when wrong.
    pub fn parse(
        limit: Option<&str>,
        after: Option<&str>,
        status: Option<&str>,
        order: Option<&str>,
    ) -> Result<ListQuery, StoreError> {
        let order = order.map(str::parse).transpose()?.unwrap_or_default();
        let limit = limit
            .map(|raw| {
                raw.parse::<i64>()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n))
                    .ok_or_else(|| {
                        StoreError::invalid(
                            "limit",
                            format!("must be a whole number from 1 to {MAX_PAGE}, got {raw:?}"),
                        )
                    })
            })
            .transpose()?;
        Ok(ListQuery {
            limit,
            after: after.map(|a| Cursor::parse(order, a)).transpose()?,
            status: status.map(str::parse).transpose()?,
            order,
        })
    }
}

/// A page of the list, and where the next one starts (`None`: this is the last).
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub items: Vec<CampaignSummary>,
    pub next: Option<Cursor>,
}

#[derive(sqlx::FromRow)]
struct SummaryRow {
    #[sqlx(flatten)]
    campaign: CampaignRow,
    sent: i64,
    failed: i64,
    retried: i64,
    invalid: i64,
    rejected: i64,
    expired: i64,
    cancelled: i64,
    rate_10s: f64,
}

/// Every campaign, by id, with its lifetime totals (`campaign_totals`) and its send rate
/// over the 10 complete seconds before `now` (the current, partial second left out).
pub async fn list(pool: &PgPool, now: DateTime<Utc>) -> Result<Vec<CampaignSummary>, StoreError> {
    Ok(page(pool, now, &ListQuery::default()).await?.items)
}

/// The statement for `query`: built from fixed fragments only (every value is bound), so
/// that each shape gets a plan that uses the index for its filter and order.
fn page_sql(query: &ListQuery) -> String {
    let mut filters = vec!["true"];
    if query.status.is_some() {
        filters.push("c.status = $3");
    }
    let (inner_order, outer_order) = match query.order {
        ListOrder::Id => {
            if query.after.is_some() {
                filters.push("c.id > $4");
            }
            ("c.id", "p.id")
        }
        ListOrder::ActiveFirst => {
            if query.after.is_some() {
                filters.push("(c.status <> 'active', c.id) > (NOT $5, $4)");
            }
            ("c.status <> 'active', c.id", "p.status <> 'active', p.id")
        }
    };
    format!(
        "WITH p AS ( \
             SELECT {COLUMNS} FROM campaigns c WHERE {filters} ORDER BY {inner_order} LIMIT $6) \
         SELECT p.*, \
                COALESCE(t.sent, 0)::int8 AS sent, COALESCE(t.failed, 0)::int8 AS failed, \
                COALESCE(t.retried, 0)::int8 AS retried, COALESCE(t.invalid, 0)::int8 AS invalid, \
                COALESCE(t.rejected, 0)::int8 AS rejected, \
                COALESCE(t.expired, 0)::int8 AS expired, \
                COALESCE(t.cancelled, 0)::int8 AS cancelled, \
                COALESCE(r.sent, 0)::float8 / 10.0 AS rate_10s \
         FROM p \
         LEFT JOIN LATERAL ( \
             SELECT sum(t.sent) AS sent, sum(t.failed) AS failed, sum(t.retried) AS retried, \
                    sum(t.invalid) AS invalid, sum(t.rejected) AS rejected, \
                    sum(t.expired) AS expired, sum(t.cancelled) AS cancelled \
             FROM campaign_totals t WHERE t.campaign_id = p.id) t ON true \
         LEFT JOIN LATERAL ( \
             SELECT sum(d.sent) AS sent FROM delivery_seconds d \
             WHERE d.campaign_id = p.id AND d.second >= $1 AND d.second < $2) r ON true \
         ORDER BY {outer_order}",
        filters = filters.join(" AND "),
    )
}

/// One page of the list (see the module docs). A full page is read with one row more
/// than asked, so `next` is `None` exactly when nothing follows.
pub async fn page(
    pool: &PgPool,
    now: DateTime<Utc>,
    query: &ListQuery,
) -> Result<Page, StoreError> {
    let end = super::campaigns::truncate_to_second(now);
    let start = end - Duration::seconds(10);
    let rows: Vec<SummaryRow> = sqlx::query_as(&page_sql(query))
        .bind(start)
        .bind(end)
        .bind(query.status.map(CampaignStatus::as_str))
        .bind(query.after.as_ref().map(|c| c.id.as_str()))
        .bind(query.after.as_ref().map(|c| c.active))
        .bind(query.limit.map(|n| n + 1))
        .fetch_all(pool)
        .await?;
    let mut items = rows
        .into_iter()
        .map(|row| {
            Ok(CampaignSummary {
                campaign: row.campaign.try_into()?,
                sent: row.sent,
                failed: row.failed,
                retried: row.retried,
                invalid: row.invalid,
                rejected: row.rejected,
                expired: row.expired,
                cancelled: row.cancelled,
                rate_10s: row.rate_10s,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let more = query.limit.is_some_and(|n| items.len() as i64 > n);
    if more {
        items.pop();
    }
    let next = more.then(|| items.last()).flatten().map(|s| Cursor {
        active: s.campaign.status == CampaignStatus::Active,
        id: s.campaign.id.clone(),
    });
    Ok(Page { items, next })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_checked_and_name_their_field() {
        let q = ListQuery::parse(Some("100"), Some("c-7"), Some("paused"), None).unwrap();
        assert_eq!(q.limit, Some(100));
        assert_eq!(q.status, Some(CampaignStatus::Paused));
        assert_eq!(q.after.as_ref().map(|c| c.id.as_str()), Some("c-7"));
        assert_eq!(
            ListQuery::parse(None, None, None, None).unwrap(),
            ListQuery::default()
        );
        for (limit, after, status, order, field) in [
            (Some("0"), None, None, None, "limit"),
            (Some("1001"), None, None, None, "limit"),
            (Some("ten"), None, None, None, "limit"),
            (None, Some("a b"), None, None, "after"),
            (None, Some(""), None, None, "after"),
            (None, Some("c-7"), None, Some("active_first"), "after"),
            (
                None,
                Some("paused:c-7"),
                None,
                Some("active_first"),
                "after",
            ),
            (None, None, Some("gone"), None, "status"),
            (None, None, None, Some("random"), "order"),
        ] {
            let e = ListQuery::parse(limit, after, status, order).unwrap_err();
            assert_eq!(e.field(), Some(field), "{e}");
        }
    }

    #[test]
    fn cursors_round_trip_in_their_order() {
        for order in [ListOrder::Id, ListOrder::ActiveFirst] {
            for active in [true, false] {
                let c = Cursor {
                    active,
                    id: "x:y.z-1".into(),
                };
                let back = Cursor::parse(order, &c.to_text(order)).unwrap();
                assert_eq!(back.id, c.id);
                if order == ListOrder::ActiveFirst {
                    assert_eq!(back.active, c.active);
                }
            }
        }
        // An id may itself contain a colon: only the first one splits.
        let c = Cursor::parse(ListOrder::ActiveFirst, "other:a:b").unwrap();
        assert_eq!((c.active, c.id.as_str()), (false, "a:b"));
    }

    #[test]
    fn each_shape_filters_and_orders_with_bound_values_only() {
        let all = page_sql(&ListQuery::default());
        assert!(all.contains("WHERE true ORDER BY c.id LIMIT $6"), "{all}");
        let q = ListQuery {
            limit: Some(10),
            after: Some(Cursor {
                active: true,
                id: "a".into(),
            }),
            status: Some(CampaignStatus::Active),
            order: ListOrder::ActiveFirst,
        };
        let sql = page_sql(&q);
        assert!(sql.contains("c.status = $3"), "{sql}");
        assert!(sql.contains("> (NOT $5, $4)"), "{sql}");
        assert!(
            !sql.contains("'a'"),
            "no value is written into the statement"
        );
    }
}
